"""Node agent: GPU backends, rank launcher, and the command protocol."""
