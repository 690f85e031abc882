"""A whole Gym stack as local processes: config, launcher, state file, participant discovery."""
