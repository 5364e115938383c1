import sys

from webhook.commands.cli import main

sys.exit(main())
