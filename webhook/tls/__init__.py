"""Certificates for the webhook's HTTPS endpoint: reading and checking them (certs, standard
library only), making them (certgen, cryptography), the development certificates serve makes
for itself (devcerts), and the TLS cipher suites (ciphers)."""
