"""Remote envs over OpenEnv's WebSocket protocol: wire frames, the server, the client."""
