"""The least a Streamlit page can cost a browser: benchmarks/browser_floor.py opens this app's pages.

    ?what=bare | chart | table | chart+table

`bare` is a title and one line of text; `chart` adds one small Plotly line chart (the browser loads
Plotly's JavaScript for it); `table` adds one small `st.dataframe` (the grid's JavaScript);
`chart+table` adds both. Nothing here imports the app.
"""
import plotly.graph_objects as go
import streamlit as st

what = st.query_params.get("what", "bare")
st.title("Floor")
st.write("The least a page can be.")
if "chart" in what:
    st.plotly_chart(go.Figure(go.Scatter(x=list(range(50)), y=[(i * 37) % 11 for i in range(50)])))
if "table" in what:
    st.dataframe([{"name": f"row {i}", "value": i / 7} for i in range(12)], hide_index=True)
