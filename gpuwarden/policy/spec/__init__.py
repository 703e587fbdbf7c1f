"""The policy language: the model, its schema, loading, the policy set, precedence, selectors, matchers and backends."""
