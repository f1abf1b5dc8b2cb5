"""Search-agent environment: synthetic world, tasks, search backends, agent loop, rewards."""
