import sys

from iris.launch import main

sys.exit(main())
