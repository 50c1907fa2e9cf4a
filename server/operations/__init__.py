"""The operations the API and the console call on a replica, one concept a module
(server.replica.Muster inherits them all)."""
