"""The env side: the in-process client, the protocol checker, and building envs from names."""
