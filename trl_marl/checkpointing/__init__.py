"""The checkpoint format: crash-safe checkpoints (staging folder, fsync, completion marker, rename), resume state,
preemption signals (`checkpoint`), and the JSON state files that name what to do when damaged (`state_files`)."""
