#!/bin/sh
# Run once by the member that bootstraps the cluster, with a superuser connection string: the application's role and
# database, as docker-compose.yml's postgres service creates them (POSTGRES_USER/PASSWORD/DB).
set -e
psql "$1" -v ON_ERROR_STOP=1 -c "CREATE ROLE orders LOGIN PASSWORD 'orders'" -c "CREATE DATABASE orders OWNER orders"
