"""The counter: the smallest resources server, the example every control-plane test and the README use."""
