"""``python -m tools.node_agent``: the node agent without the ``gemmanet`` CLI around it."""

import sys

from tools.node_agent.cli import main

sys.exit(main())
