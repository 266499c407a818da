"""What one invocation leaves behind, below every layer that writes or reads it: its record (`record.py`)
and the layout of its job directory (`jobdir.py`)."""
