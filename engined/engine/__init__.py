"""The model loop and what it schedules: sequences, sampling, the prefix cache, memory accounting."""
