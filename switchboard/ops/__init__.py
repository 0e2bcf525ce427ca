"""Running the stack: start and stop it (launch), keep it alive (supervisor), install the backend."""
