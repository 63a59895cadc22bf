"""``python -m trainer.experiments.report docs/experiments/<name>``: build that experiment's report."""

import sys

from trainer.experiments.report import main

sys.exit(main())
