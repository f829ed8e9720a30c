from fides_rag.demo.cli import main

raise SystemExit(main())
