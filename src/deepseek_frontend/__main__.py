import sys

from deepseek_frontend.cli import main

sys.exit(main())
