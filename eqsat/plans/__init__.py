"""What a plan is and where it lives: its signature, options, life (the state machine), caches and stores."""
