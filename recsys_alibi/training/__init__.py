"""Lightning training: module, data module, losses, callbacks."""
