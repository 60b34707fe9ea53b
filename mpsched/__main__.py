from mpsched._cli import main

raise SystemExit(main())
