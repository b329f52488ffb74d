"""Insert builders and statements, lanes, COPY, the bridge; imports observability and below."""
