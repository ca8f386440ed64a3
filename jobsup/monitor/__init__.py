"""`jobsup top`: the live console."""
