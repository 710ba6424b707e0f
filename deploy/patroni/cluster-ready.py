#!/usr/bin/python3
# The members' healthcheck in docker-compose.cluster.yml: healthy once this member's Patroni answers and the cluster has
# a running leader and a synchronous standby (test/support/ha-postgres.ts waits for the same). The api starts after it:
# with DATABASE_REQUIRE_SYNCHRONOUS_STANDBY=true it refuses a primary that acknowledges commits alone.
import json
import sys
import urllib.request

with urllib.request.urlopen("http://127.0.0.1:8008/cluster", timeout=2) as answer:
    members = json.load(answer)["members"]
up = [m for m in members if m.get("state") in ("running", "streaming")]
leader = any(m["role"] == "leader" for m in up)
sync_standby = any(m["role"] == "sync_standby" for m in up)
sys.exit(0 if leader and sync_standby else 1)
