"""The blackjack environment server (/reset, /step), its game and checkpointable deck generator."""
