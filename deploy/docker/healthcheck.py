"""Container healthcheck for every Rallypoint service (stdlib only, runs as the image's HEALTHCHECK).

GET http://127.0.0.1:<port>/healthz must answer 2xx within 3 s. The port is RALLY_HEALTH_PORT when set
(every non-api service in docker-compose.yml and deploy/k8s sets 8081), otherwise RALLY_HTTP_PORT,
otherwise 8080 (the api's HTTP port).
"""

import os
import sys
import urllib.request


def main() -> int:
    port = os.environ.get("RALLY_HEALTH_PORT") or os.environ.get("RALLY_HTTP_PORT") or "8080"
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return 0 if 200 <= response.status < 300 else 1
    except Exception as exc:  # any failure is "unhealthy"
        print(f"healthcheck {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
