"""One job per invocation: its plan, its script, and the record that lets later commands find it."""
