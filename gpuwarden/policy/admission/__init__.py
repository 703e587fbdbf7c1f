"""Admission decisions: placement, the mutating patch, the validating checks, and the pipeline that runs both."""
