"""The platform-neutral chat flow every adapter calls: access, admin commands, feedback, rendering, bot state."""
