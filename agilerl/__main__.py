from agilerl.cli.main import main

raise SystemExit(main())
