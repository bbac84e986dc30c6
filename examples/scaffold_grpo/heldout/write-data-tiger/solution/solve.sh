#!/bin/bash
echo tiger > /workspace/data.txt
