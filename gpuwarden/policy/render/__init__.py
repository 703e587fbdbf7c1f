"""Cluster objects a policy set implies: PriorityClasses, quotas, queues, Kueue, the webhooks' scope and packing."""
