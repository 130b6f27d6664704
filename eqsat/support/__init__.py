"""Support every layer uses: errors, background threads, worker processes, progress, small caches."""
