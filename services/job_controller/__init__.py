"""The job controller service: drives bound jobs through launch, exits and cancellation."""
