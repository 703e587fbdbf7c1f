from gpuwarden.cli import main

raise SystemExit(main())
