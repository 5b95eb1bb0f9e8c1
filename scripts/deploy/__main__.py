"""``python -m scripts.deploy``: the deploy test (scripts/deploy_smoke.sh runs it)."""

import sys

from scripts.deploy.smoke import main

sys.exit(main())
