"""Capacity and saturation: capacity under an SLO and its paired ratio (`slo`), the crossover by request rate (`crossover`), the over-saturation test (`saturation`)."""
