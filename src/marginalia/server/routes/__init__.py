"""The service's routes, one module per group: collections and jobs, reading, and the compatible APIs."""
