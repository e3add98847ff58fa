"""What the long-running processes (coordinator, worker) need from their host: the event loop
(``aio``), a child process's environment (``childenv``), network interfaces (``netif``) and the
Prometheus scrape endpoint (``promhttp``)."""
