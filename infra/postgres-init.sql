-- One Postgres for both servers: a database each (see docker-compose.yml).
CREATE DATABASE prefect;
CREATE DATABASE mlflow;
