"""``python -m rallypoint_services.agent ...`` == ``rally serve agent ...``."""

from .service import main

raise SystemExit(main())
