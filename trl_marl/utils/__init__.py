"""Small helpers every layer above the math may use: optional-extra imports (`import_utils`), progress bars
(`progress`) and keeping secrets out of configs, logs and checkpoints (`secrets`)."""
