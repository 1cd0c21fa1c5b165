import sys

from memrl.cli import main

sys.exit(main())
