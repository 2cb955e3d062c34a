"""The async engine's machinery: the draft and target worker processes (workers), the typed messages
between the two groups and their transports (protocol), the supervisor that watches them, the worker
group that starts them, and the draft host of async across two machines (draft_host)."""
