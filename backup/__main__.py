import sys

from backup.run import main

sys.exit(main())
