from fedmedbench.cli import main

raise SystemExit(main())
