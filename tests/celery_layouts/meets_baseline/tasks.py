from meets_baseline import app


@app.task(time_limit=60, soft_time_limit=50)
def thumbnail(path: str, size: int) -> str:
    return f"{path}@{size}"
