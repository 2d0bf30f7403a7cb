"""raypulse launcher: submit a Ray training job in one command (see `launcher --help`)."""
