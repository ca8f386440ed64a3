"""`jobsup start`: the supervisor process and its isolated workers."""
