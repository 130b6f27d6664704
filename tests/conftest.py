import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
# tests plan with the bundled device profiles, not with one `python -m eqsat calibrate` left in the user's cache
os.environ["EQSAT_CACHE_DIR"] = tempfile.mkdtemp(prefix="eqsat-test-cache-")
# plans are kept unmeasured (eqsat/guard.py): timing on a loaded CI machine would make tests depend on its load;
# tests/test_guard.py sets the budget itself
os.environ["EQSAT_GUARD_SECONDS"] = "0"
