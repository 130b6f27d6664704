import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
# tests plan with the bundled device profiles, not with one `python -m eqsat calibrate` left in the user's cache
os.environ["EQSAT_CACHE_DIR"] = tempfile.mkdtemp(prefix="eqsat-test-cache-")
# each test plans afresh (tests that keep plans across processes switch the store on themselves)
os.environ["EQSAT_PLAN_STORE"] = "off"
