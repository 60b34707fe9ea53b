from mpsched._cli.main import main

raise SystemExit(main())
