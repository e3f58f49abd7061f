"""The coding agent's environment: sandboxed workspaces, generated bug-fix tasks, hidden tests."""
