"""Reference harnesses, each a small real product. They import only harness, rewards and types."""
