"""Faults: who is alive, bounded waits, and what a task does when a peer dies or stalls.

Owns the liveness probes (hooks.faults.liveness), the deadline-bounded session runs every
wait uses (waiting), each task's heartbeat that bounds waits by progress (heartbeat), the recovery guard around TensorFlow's own session recovery and the
process exit it may take, and the synchronous step's watchdog bookkeeping and diagnosis.
Imports the bottom layer and hooks.config.
"""
