"""What it runs on: devices, links and nodes (hardware profiles, package data) and the collectives over them."""
