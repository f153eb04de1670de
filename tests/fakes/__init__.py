"""Local stand-ins for the external services ragbot talks to (real HTTP on 127.0.0.1, real wire formats)."""
